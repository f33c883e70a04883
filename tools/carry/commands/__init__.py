"""One module per command: each parses its options (carry.options) and calls the library."""
