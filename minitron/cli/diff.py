"""`minitron diff DIR_A DIR_B`: two traced runs side by side (the view: cli/views/diff.py)."""
