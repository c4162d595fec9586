"""Test-only alias: Horovod's package names over gyre, so that Horovod's own
test files run unmodified against gyre (tests/conformance/horovod). Every
module here only re-exports gyre names; it is never installed."""
