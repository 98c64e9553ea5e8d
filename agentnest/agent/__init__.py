"""The in-sandbox agent: stdlib only, imports nothing outside ``agent/``.

It is shipped into the sandbox as source over the agent channel (see
:mod:`agentnest.runtime.bootstrap`) and speaks the protocol of
:mod:`agentnest.agent.wire` on its stdin and stdout.
"""
