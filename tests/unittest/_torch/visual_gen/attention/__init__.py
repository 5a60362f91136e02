"""attention component tests (issue [D])."""
