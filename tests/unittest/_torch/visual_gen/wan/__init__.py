"""wan component tests (issue [D])."""
