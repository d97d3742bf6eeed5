"""One module per check family. Each lists its check classes in `CHECKS`; checks.registry
lists the families, so registration flows one way and importing this package loads nothing."""
