"""Reusable pieces of the pages: navbar, KPI cards, status badges, messages, the empty state."""
