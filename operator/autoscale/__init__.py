"""kubeinfer package."""
