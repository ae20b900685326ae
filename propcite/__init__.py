"""PropCite: attribute each proposition of a generated answer to the passages that support it."""
