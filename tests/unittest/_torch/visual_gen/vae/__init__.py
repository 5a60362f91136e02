"""vae component tests (issue [D])."""
