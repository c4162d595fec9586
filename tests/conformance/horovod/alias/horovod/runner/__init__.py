"""Package marker of the test-only alias (re-exports only)."""
