"""Drop-in compatibility with the released agentnest 0.3.0 (issue 11)."""
