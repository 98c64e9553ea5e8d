"""Alembic's environment for the manager's database (run by :meth:`agentnest.server.db.Database.upgrade`).

The caller passes an open connection (``config.attributes["connection"]``),
inside its transaction: on PostgreSQL that transaction holds the advisory
lock that keeps replicas from migrating at the same time.
"""

from __future__ import annotations

from alembic import context

from agentnest.server.db_tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the migrations with `agentnest serve db upgrade`, not the alembic command")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
