"""The loader of every program AgentNest ships into a sandbox as a bundle, and the agent's modules.

:data:`UNPACK` is the text both the agent's bootstrap (:data:`.bootstrap.BOOTSTRAP`) and
packaged programs (:data:`.launch.RUN`, the egress proxy) start with; :func:`.launch.pack`
makes the bundles it reads.  It decides nothing about a sandbox's confinement: it defines
modules in memory, so nothing is written to the sandbox's filesystem.
"""

from __future__ import annotations

#: Load order matters: a module's relative imports must already be loaded.
AGENT_MODULES = ("wire", "limits", "files", "tree", "exec", "sessions", "repl", "loop")

#: The one loader of every program shipped as a bundle (:func:`.launch.pack`): the
#: agent (:data:`BOOTSTRAP`) and the egress proxy (:func:`.launch.program_command`).
#: ``unpack(PKG, blob, lazy)`` defines the package ``PKG`` and its modules in
#: memory, in the bundle's order, except those in ``lazy``; it returns the
#: package, ``define(name, source)`` for the lazy ones, and the bundle's
#: ``[name, source]`` pairs.  Stdlib only, Python 3.8 compatible.
UNPACK = r"""
import sys
def unpack(package, bundle, lazy=()):
    import json, types, zlib
    modules = json.loads(zlib.decompress(bundle))
    top = types.ModuleType(package)
    top.__path__ = []
    top.__package__ = package
    sys.modules[package] = top
    def define(module, source):
        new = types.ModuleType(package + "." + module)
        new.__package__ = package
        new.__file__ = "<%s/%s.py>" % (package.replace("_", "-"), module)
        sys.modules[new.__name__] = new
        setattr(top, module, new)
        exec(compile(source, new.__file__, "exec"), new.__dict__)
        return new
    for module, source in modules:
        if module not in lazy:
            define(module, source)
    return top, define, modules
"""
