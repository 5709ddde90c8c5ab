"""Rewrites a Python file's Lightning imports, and the names reached through them, into ours, with libcst.

libcst keeps every comment and blank line, and its scope analysis says which name refers to which import
(also inside functions, ``TYPE_CHECKING`` blocks and string annotations). Imports of names keep the
names the file uses (``from trainer import TrainModule as LightningModule``), so only import lines
change; a name reached through a module (``L.pytorch.callbacks.ModelCheckpoint``) becomes ours in place.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ImportAssignment, MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from trainer.migrate.names import is_lightning, resolve, resolve_module, spelled
from trainer.migrate.problem import Problem

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_IMPORTS_LIGHTNING = re.compile(r"^[ \t]*(?:from|import)[ \t]+(?:lightning|pytorch_lightning)\b", re.MULTILINE)


@dataclass(frozen=True)
class _Binding:
    """A name bound to a Lightning module: ``import lightning as L`` binds ``L`` to ``lightning``."""

    lightning: str  # the module, in Lightning's current spelling
    ours: str | None  # the module the rewritten import binds the same name to; None: the import goes


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def _alias(name: str, asname: str | None) -> cst.ImportAlias:
    as_name = cst.AsName(name=cst.Name(asname)) if asname else None
    return cst.ImportAlias(name=cst.parse_expression(name), asname=as_name)


class _Plan(cst.BatchableCSTVisitor):
    """Reads the file once and decides every change: new import statements, replaced expressions, problems."""

    METADATA_DEPENDENCIES = (PositionProvider, ScopeProvider, ParentNodeProvider)

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.bindings: dict[tuple[cst.CSTNode, str], _Binding] = {}
        self.imports: dict[cst.CSTNode, cst.CSTNode | list[cst.BaseSmallStatement] | None] = {}
        self.expressions: dict[cst.CSTNode, str] = {}
        self.strings: dict[cst.CSTNode, str] = {}  # string literals that are Lightning names
        self.needed: dict[tuple[str, str, str], None] = {}  # (our module, our name, local name) to import
        self.named: dict[str, str] = {}  # a name a Lightning from-import binds -> our name it will hold
        self.problems: list[Problem] = []

    def _problem(self, node: cst.CSTNode, message: str) -> None:
        self.problems.append(Problem(self.path, self.get_metadata(PositionProvider, node).start.line, message))

    def visit_Import(self, node: cst.Import) -> None:
        if not any(is_lightning(_dotted(a.name) or "") for a in node.names):
            return
        kept: list[cst.ImportAlias] = []
        for alias in node.names:
            name = _dotted(alias.name) or ""
            if not is_lightning(name):
                kept.append(alias)
            elif alias.asname is not None:  # import lightning as L: keeps L, bound to our module
                bound = alias.asname.name.value
                ours = resolve_module(name)
                self.bindings[(node, bound)] = _Binding(spelled(name), ours)
                if ours is not None:
                    kept.append(alias.with_changes(name=cst.parse_expression(ours)))
            else:  # import lightning.pytorch binds `lightning`: each use becomes our name, imported
                parts = name.split(".")  # libcst names an access by the prefix it reaches: lightning.pytorch, ...
                for end in range(1, len(parts) + 1):
                    self.bindings[(node, ".".join(parts[:end]))] = _Binding(spelled(".".join(parts[:end])), None)
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        self.imports[node] = node.with_changes(names=kept) if kept else None

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = _dotted(node.module) if node.module is not None and not node.relative else None
        if module is None or not is_lightning(module):
            return
        if isinstance(node.names, cst.ImportStar):
            ours = resolve_module(module)
            if ours is None:
                self._problem(node, f"no counterpart for {spelled(module)}.*")
            else:
                self.imports[node] = node.with_changes(module=cst.parse_expression(ours))
            return
        groups: dict[str, list[cst.ImportAlias]] = {}  # our module -> its names, in the file's order
        modules: list[cst.BaseSmallStatement] = []
        for alias in node.names:
            name = alias.name.value
            bound = alias.asname.name.value if alias.asname is not None else name
            lightning = f"{spelled(module)}.{name}"
            target, ours_module = resolve(lightning), resolve_module(lightning)
            if target is not None:
                ours, _, ours_name = target.rpartition(".")
                asname = bound if bound != ours_name else None
                self.named[bound] = target
                groups.setdefault(ours, []).append(
                    alias.with_changes(name=cst.Name(ours_name), asname=_alias(ours_name, asname).asname)
                )
            elif ours_module is not None:  # from lightning.pytorch import loggers as pl_loggers
                self.bindings[(node, bound)] = _Binding(lightning, ours_module)
                asname = None if ours_module == bound else bound
                modules.append(cst.Import(names=[_alias(ours_module, asname)]))
            elif name.islower():  # a module we have none for (utilities): each name used through it becomes ours
                self.bindings[(node, bound)] = _Binding(lightning, None)
            else:
                self._problem(node, f"no counterpart for {lightning}")
        if len(groups) == 1 and not modules:  # one module of ours: the statement keeps its layout and comments
            (ours, aliases), = groups.items()
            aliases[-1] = aliases[-1].with_changes(comma=node.names[-1].comma)
            self.imports[node] = node.with_changes(module=cst.parse_expression(ours), names=aliases)
            return
        statements: list[cst.BaseSmallStatement] = []
        for ours, aliases in groups.items():
            aliases = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in aliases]
            statements.append(cst.ImportFrom(module=cst.parse_expression(ours), names=aliases))
        self.imports[node] = statements + modules

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        """A string that is a Lightning name (a jsonargparse ``class_path``) becomes ours."""
        if "lightning" not in node.value:
            return
        text = ast.literal_eval(node.value)
        if not isinstance(text, str) or not _DOTTED.fullmatch(text) or not is_lightning(text):
            return
        target = resolve(text)
        if target is not None:
            self.strings[node] = node.value.replace(text, target)
        elif resolve_module(text) is None and text.rpartition(".")[2][:1].isupper():  # a class path we cannot map
            self._problem(node, f"no counterpart for {text}")

    def leave_Module(self, original_node: cst.Module) -> None:
        scopes = {s for s in self.metadata[ScopeProvider].values() if s is not None}
        taken = {a.name for s in scopes for a in s.assignments}
        positions = self.metadata[PositionProvider]
        uses = []
        for scope in scopes:
            for access in scope.accesses:
                for referent in access.referents:
                    if isinstance(referent, ImportAssignment) and (referent.node, referent.name) in self.bindings:
                        where = positions[access.node].start
                        uses.append((where.line, where.column, access.node, referent))
                        break
        for *_, node, referent in sorted(uses, key=lambda use: use[:2]):  # in the file's order: the same output always
            self._use(node, self.bindings[(referent.node, referent.name)], referent.name, taken)
        self.expressions = {**self.strings, **self.expressions}  # an annotation's own rewrite comes first

    def _use(self, node: cst.CSTNode, binding: _Binding, bound: str, taken: set[str]) -> None:
        if isinstance(node, cst.SimpleString):  # a string annotation: "pl.LightningModule"
            value = self.expressions.get(node, node.value)  # another alias in the same string may have changed it
            text = ast.literal_eval(value)
            new = _DOTTED.sub(lambda m: self._rewrite(node, m[0], binding, bound, taken) or m[0], text)
            if new != text:
                self.expressions[node] = value.replace(text, new)
            return
        parents = self.metadata[ParentNodeProvider]
        while isinstance(parents.get(node), cst.Attribute) and parents[node].value is node:
            node = parents[node]
        new = self._rewrite(node, _dotted(node) or bound, binding, bound, taken)
        if new is not None:
            self.expressions[node] = new

    def _local(self, ours: str, name: str, taken: set[str]) -> str:
        """The name under which ``ours.name`` is imported: its own, unless the file binds that to something else."""
        claimed = {local: (module, imported) for module, imported, local in self.needed}
        local = name
        while True:
            if local in claimed:
                if claimed[local] == (ours, name):
                    return local
            elif local not in taken or self.named.get(local) == f"{ours}.{name}":
                return local
            local += "_"

    def _rewrite(self, node: cst.CSTNode, chain: str, binding: _Binding, bound: str, taken: set[str]) -> str | None:
        """The text that replaces ``chain`` (``bound`` then attributes), or None to leave it."""
        if chain != bound and not chain.startswith(bound + "."):
            return None
        rest = chain[len(bound):].lstrip(".").split(".") if chain != bound else []
        parts = binding.lightning.split(".") + rest
        for end in range(len(parts), len(binding.lightning.split(".")), -1):
            target = resolve(".".join(parts[:end]))
            if target is None:
                continue
            ours, _, ours_name = target.rpartition(".")
            tail = "".join("." + p for p in parts[end:])
            if ours == binding.ours:
                return f"{bound}.{ours_name}{tail}"
            local = self._local(ours, ours_name, taken)
            self.needed[(ours, ours_name, local)] = None
            return local + tail
        whole = ".".join(parts)
        if resolve_module(whole) is not None and resolve_module(whole) == binding.ours:
            return bound if chain != bound else None
        if chain == bound and binding.ours is not None:
            return None
        known_module = resolve_module(whole) is not None  # else a name we lack, imported by name (from x import f)
        what = f"cannot rewrite a use of the module {whole} itself" if known_module else f"no counterpart for {whole}"
        self._problem(node, what)
        return None


class _Apply(cst.CSTTransformer):
    """Writes the plan's changes into the tree."""

    def __init__(self, plan: _Plan) -> None:
        super().__init__()
        self.plan = plan

    def _imports(self, original: cst.CSTNode, updated: cst.CSTNode):
        if original not in self.plan.imports:
            return updated
        new = self.plan.imports[original]
        if new is None:
            return cst.RemoveFromParent()
        return cst.FlattenSentinel(new) if isinstance(new, list) else new

    def leave_Import(self, original_node, updated_node):
        return self._imports(original_node, updated_node)

    def leave_ImportFrom(self, original_node, updated_node):
        return self._imports(original_node, updated_node)

    def _expression(self, original: cst.CSTNode, updated: cst.CSTNode):
        if original in self.plan.expressions:
            text = self.plan.expressions[original]
            return cst.SimpleString(text) if isinstance(original, cst.SimpleString) else cst.parse_expression(text)
        return updated

    def leave_Name(self, original_node, updated_node):
        return self._expression(original_node, updated_node)

    def leave_Attribute(self, original_node, updated_node):
        return self._expression(original_node, updated_node)

    def leave_SimpleString(self, original_node, updated_node):
        return self._expression(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(original_node.body) != 1 or len(updated_node.body) < 2:
            return updated_node
        # one import split into several (their names go to several modules of ours): one line each
        body = [b.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for b in updated_node.body]
        lines = [cst.SimpleStatementLine(body=[b]) for b in body]
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        lines[-1] = lines[-1].with_changes(trailing_whitespace=updated_node.trailing_whitespace)
        return cst.FlattenSentinel(lines)

    def leave_IndentedBlock(self, original_node, updated_node):
        if not updated_node.body:  # an `if TYPE_CHECKING:` that held only a Lightning import
            return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
        return updated_node


def migrate_python(source: str, path: str) -> tuple[str, list[Problem]]:
    """``source`` with Lightning's names replaced by ours, and what could not be; with a problem the source
    comes back as it was (a file is never half rewritten)."""
    if "lightning" not in source:
        return source, []
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as e:  # reported only when the file imports Lightning: others are not ours to judge
        if not _IMPORTS_LIGHTNING.search(source):
            return source, []
        return source, [Problem(path, e.raw_line, f"cannot parse the file ({e.message})")]
    plan = _Plan(path)
    wrapper.visit_batched([plan])
    if plan.problems:
        return source, sorted(plan.problems, key=lambda p: p.line)
    module = wrapper.module.visit(_Apply(plan))
    if plan.needed:
        context = CodemodContext()
        for ours, name, local in plan.needed:
            AddImportsVisitor.add_needed_import(context, ours, name, local if local != name else None)
        module = AddImportsVisitor(context).transform_module(module)
    removed = {name.partition(".")[0] for (_, name), b in plan.bindings.items() if b.ours is None}
    left = _unbound(module, removed, path)
    if left or module.code == wrapper.module.code:  # nothing rewritten: the bytes as they were (libcst's round trip
        return source, left  # drops the last newline after a comment that ends in a backslash)
    return module.code, []


def _unbound(module: cst.Module, names: set[str], path: str) -> list[Problem]:
    """Uses of ``names`` (bound by an import the rewrite removed) that nothing binds any more: a last check that
    no use was missed, which would leave a file that fails at run time."""
    if not names:
        return []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes, positions = wrapper.resolve(ScopeProvider), wrapper.resolve(PositionProvider)
    found = []
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            node = access.node
            if isinstance(node, cst.Name) and node.value in names and not access.referents:
                line = positions[node].start.line
                found.append(Problem(path, line, f"cannot rewrite this use of {node.value}: left as it is"))
    return sorted(found, key=lambda p: p.line)
