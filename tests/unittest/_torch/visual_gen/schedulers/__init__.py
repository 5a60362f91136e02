"""schedulers component tests (issue [D])."""
