"""The optimizer step: what configure_optimizers returns, automatic and manual optimization, closure optimizers."""
