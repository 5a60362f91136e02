"""flux component tests (issue [D])."""
