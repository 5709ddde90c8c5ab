"""The documentation runs: every ```python block in README.md and docs/**/*.md is executed.

The convention, which every page is written to:

- the ```python blocks of one page run in order in ONE fresh Python process, sharing their
  globals like a notebook's cells, with a temporary folder as the working directory;
- a block right after a line ``<!-- skip: needs a GPU -->`` or
  ``<!-- skip: needs several machines -->`` is not run; any other skip reason fails;
- ```bash, ```yaml, ```text and other blocks are not run.

The page runs as ``__main__``, as a script would, so its ``if __name__ == "__main__":`` blocks
run. A DDP worker that the page spawns re-imports it: there only the page's imports, functions,
classes and constant assignments are defined (what unpickling the model needs), and nothing
is trained again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import script_environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWED_SKIPS = ("needs a GPU", "needs several machines")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")


def _pages() -> list[str]:
    pages = ["README.md"]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        pages += [os.path.relpath(os.path.join(folder, n), ROOT).replace(os.sep, "/") for n in names if n.endswith(".md")]
    return sorted(pages)


def parse(text: str) -> tuple[list[tuple[int, str, str | None]], list[str]]:
    """The page's python blocks as (line number, code, skip reason or None), and its mistakes
    (a skip reason that is not allowed, a skip mark that no python block follows)."""
    lines = text.splitlines()
    blocks: list[tuple[int, str, str | None]] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # a skip mark waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        skip = SKIP.match(line)
        fence = FENCE.match(line)
        if skip:
            if pending:
                problems.append(f"line {pending[0]}: a skip mark with no ```python block after it")
            pending = (i + 1, skip["reason"])
            if skip["reason"] not in ALLOWED_SKIPS:
                problems.append(f"line {i + 1}: skip reason {skip['reason']!r} is not allowed; the only ones are {ALLOWED_SKIPS}")
        elif fence:
            indent, mark, info = fence["indent"], fence["fence"], fence["info"].strip()
            start, body = i + 1, []
            i += 1
            while i < len(lines):
                close = FENCE.match(lines[i])
                if close and close["fence"].startswith(mark[0]) and len(close["fence"]) >= len(mark) and not close["info"].strip():
                    break
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            language = info.split()[0].lower() if info else ""
            if language in ("python", "py"):
                blocks.append((start, "\n".join(body) + "\n", pending[1] if pending else None))
            elif pending:
                problems.append(f"line {pending[0]}: a skip mark before a ```{language} block, which is never run anyway")
            pending = None
        elif line.strip() and pending:
            problems.append(f"line {pending[0]}: a skip mark with no ```python block right after it")
            pending = None
        i += 1
    if pending:
        problems.append(f"line {pending[0]}: a skip mark with no ```python block after it")
    return blocks, problems


# Run as the page's own __main__: each block is exec'd in this module's globals, so the page's
# classes are __main__.<name> and pickle finds them. In a spawned DDP worker (__mp_main__) only
# definitions run (see the module docstring).
DRIVER = r'''
import ast as _ast, json as _json, linecache as _linecache, sys as _sys, traceback as _traceback

_PAGE, _BLOCKS = {page!r}, _json.loads({blocks!r})


def _definitions_only(_source):
    _keep = []
    for _node in _ast.parse(_source).body:
        if isinstance(_node, (_ast.Import, _ast.ImportFrom, _ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef)):
            _keep.append(_node)
        elif isinstance(_node, (_ast.Assign, _ast.AnnAssign)) and _node.value is not None:
            try:
                _ast.literal_eval(_node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            _keep.append(_node)
    return _ast.Module(body=_keep, type_ignores=[])


for _line, _source in _BLOCKS:
    _name = f"{{_PAGE}}:{{_line}}"
    _linecache.cache[_name] = (len(_source), None, _source.splitlines(True), _name)
    if __name__ != "__main__":
        exec(compile(_definitions_only(_source), _name, "exec"), globals())
        continue
    print(f"\n----- {{_name}}: running the block that starts on line {{_line}}", flush=True)
    try:
        exec(compile(_source, _name, "exec"), globals())
    except BaseException:
        _sys.stdout.flush()
        print(f"\n----- {{_name}}: the block that starts on line {{_line}} failed:\n{{_source}}", file=_sys.stderr)
        _traceback.print_exc()
        _sys.exit(1)
'''


def test_the_docs_have_python_blocks_to_run():
    runnable = {page: [b for b in parse(open(os.path.join(ROOT, page), encoding="utf-8").read())[0] if b[2] is None] for page in _pages()}
    assert runnable["README.md"], "README.md should hold a complete ```python example"
    assert sum(len(b) for b in runnable.values()) >= 20, {page: len(b) for page, b in runnable.items()}


def test_the_parser_finds_blocks_skips_and_bad_marks():
    page = (
        "# A page\n\n```python\nx = 1\n```\n\n<!-- skip: needs a GPU -->\n```python\ny = 2\n```\n\n"
        "- a list item\n\n    ```python\n    z = 3\n    ```\n\n```bash\necho no\n```\n\n"
        "<!-- skip: too slow -->\n```python\nw = 4\n```\n\n<!-- skip: needs several machines -->\nText.\n"
    )
    blocks, problems = parse(page)
    assert [(code, skip) for _, code, skip in blocks] == [("x = 1\n", None), ("y = 2\n", "needs a GPU"), ("z = 3\n", None), ("w = 4\n", "too slow")]
    assert len(problems) == 2 and "'too slow' is not allowed" in problems[0] and "no ```python block right after it" in problems[1]


def test_a_page_shares_globals_across_blocks_and_a_failure_names_its_block(tmp_path):
    blocks = [(3, "x = 41\nprint('first block ran')\n"), (8, "x += 1\nprint('x is', x)\n"), (12, "raise RuntimeError('boom')\n"), (15, "print('never')\n")]
    returncode, output, _ = _run_page("docs/example.md", blocks, tmp_path)
    assert returncode == 1
    assert "first block ran" in output and "x is 42" in output and "never" not in output
    assert "docs/example.md:12: the block that starts on line 12 failed" in output
    assert 'File "docs/example.md:12", line 1' in output and "RuntimeError: boom" in output


def test_every_docs_page_is_in_the_mkdocs_nav():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = set(re.findall(r"([\w./-]+\.md)\b", f.read().split("\nnav:", 1)[1]))
    pages = {page.removeprefix("docs/") for page in _pages() if page.startswith("docs/")}
    assert not pages - nav, f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert not nav - pages, f"mkdocs.yml's nav names pages that do not exist: {sorted(nav - pages)}"


def _run_page(page: str, blocks: list[tuple[int, str]], folder) -> tuple[int, str, float]:
    driver = folder / f"{os.path.basename(page)[:-3]}_page.py"
    driver.write_text(DRIVER.format(page=page, blocks=json.dumps(blocks)))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(driver)], cwd=folder, env=script_environment(ROOT, folder), capture_output=True, text=True, timeout=PAGE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, f"{out[-6000:]}\n(timed out after {PAGE_TIMEOUT_S} s)", time.perf_counter() - started
    return done.returncode, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}", time.perf_counter() - started


PAGE_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def page_runs(request, tmp_path_factory):
    """Every selected page's run, started at once: the pages are independent processes, so they
    share the machine's cores (one page at a time would leave all but one idle)."""
    selected = [item.callspec.params["page"] for item in request.session.items if item.originalname == "test_page_runs"]
    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
    runs = {}
    for page in selected:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            blocks = [(line, code) for line, code, skip in parse(f.read())[0] if skip is None]
        if blocks:
            folder = tmp_path_factory.mktemp(re.sub(r"\W+", "_", page))
            runs[page] = pool.submit(_run_page, page, blocks, folder)
    yield runs
    pool.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages())
def test_page_runs(page, page_runs):
    """The page's python blocks run in order in one fresh process, in a temporary folder."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        problems = parse(f.read())[1]
    assert not problems, f"{page}: " + "; ".join(problems)
    if page not in page_runs:
        return  # nothing to run on this page
    returncode, output, took = page_runs[page].result()
    if returncode != 0:
        pytest.fail(f"{page} failed after {took:.1f} s:\n{output}", pytrace=False)
