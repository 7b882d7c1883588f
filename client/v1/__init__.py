"""Generated protocol code for outrig.v1."""
