"""The vae component tests share the visual_gen test environment (see _fixtures.component_test_env)."""

from _fixtures import component_test_env  # noqa: F401
