"""Security: who is calling (TLS client certificates, signed bearer tokens) and what they may do
(a grant policy with cached decisions). See docs/security.md.

- `principal`: `Principal`, `ANONYMOUS`.
- `tokens`: Ed25519 JWTs (PyJWT): key pairs, issuing, `TokenVerifier` with its cache.
- `certs`: development CA and certificates (`outrig certs dev`).
- `policy`: the grant policy, its patterns and its decision cache.
- `policy_file`: a policy file and its reloads (SIGHUP, file change).
- `access`: what each RPC asks for, as (action, space, types).
- `guard`: the one check every call passes.
- `settings`: server credentials, the guard built from the configuration, and the listening rules.
"""
