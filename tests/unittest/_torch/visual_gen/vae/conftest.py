"""The vae component tests share the visual_gen test environment (see _components.component_test_env)."""

from _components import component_test_env  # noqa: F401
