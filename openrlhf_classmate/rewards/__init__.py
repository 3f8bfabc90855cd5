"""Group-level reward methods that run as reward hooks of the experience maker (DARLING, ...)."""
