# Shared fixtures for every suite under this tree (core and plugins): `srv` and `client`
# serve the `ckpt` a test module defines. See mlxbun_core/testing/fixtures.py.
pytest_plugins = ["mlxbun_core.testing.fixtures"]
