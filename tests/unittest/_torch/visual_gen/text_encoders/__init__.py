"""text_encoders component tests (issue [D])."""
