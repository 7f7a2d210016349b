"""The database schema: declared tables and the versioned migrations that create them."""
