"""The web console (`outrig serve --console HOST:PORT`): an operator's pages over the admin API.

An HTTP adapter beside the gRPC one, in `outrig serve`'s process and on its event loop. Every page
is made from calls to the servicer's own methods (`calls.py`), run as a gRPC call or a Mux
operation is (`SpaceServicer.perform`: the guard, the policy, forwarding in a tier, metrics), with
the browser's bearer token as the call's credential: the console can show nothing its user could
not ask the API for. Pages are server-rendered Jinja2 templates made live with htmx, which is
vendored as a static file (static/htmx.min.js, htmx.org 2.0.8, 0BSD): no external network at run
time, no Node toolchain at install.
"""
