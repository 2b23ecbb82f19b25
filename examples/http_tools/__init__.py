"""Example 1: a read tool and an HTTP write tool against a tiny notes service built on the idempotency kit."""
