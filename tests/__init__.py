"""lorafleet's tests: a package, so that shared helpers import as ``tests.factories``."""
