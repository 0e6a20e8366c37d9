"""Reading a plan before it is applied: diff, replay before and after, an HTML report."""
