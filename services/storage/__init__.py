"""Storage: SQLAlchemy 2 tables, engines, the group-commit writer and run loaders (SQLite or PostgreSQL)."""
