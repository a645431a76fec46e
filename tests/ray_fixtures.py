"""Ray fixtures (owned by the pool work)."""
