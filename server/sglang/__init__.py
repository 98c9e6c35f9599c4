"""Topas inside real SGLang (0.5.23) through its plugin framework. See docs/sglang.md.

Modules: `plugin` (entry point, hook trampolines, install/uninstall), `adapter` (the work),
`labels_http` (label transport), `snapshot`, `apply`, `residency`, `tasks`, `config`,
`launch` (`topas serve --engine sglang`). Nothing here imports SGLang at import time.
"""
