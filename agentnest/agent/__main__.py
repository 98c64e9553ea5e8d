"""Run the agent on this process's stdin/stdout (tests and local debugging)."""

from __future__ import annotations

from .loop import main

if __name__ == "__main__":
    main()
