"""Optional framework callbacks; each module imports its framework only when imported itself."""
