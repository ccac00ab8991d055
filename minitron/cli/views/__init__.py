"""The views of a trace directory, for the command line.

A trace is what ranks wrote (``rank{R}.jsonl``, the format in minitron/trace/schema.py);
minitron/trace/reader.py reads it back, checked, and everything here takes what it returns:
``call_tree``, ``group_table``, ``checks`` and ``schedule`` turn it into what the terminal shows, ``perfetto`` into ``trace.json``, and
``show`` prints the chosen views the same way for `minitron trace` and `minitron view`.
``layout`` draws a layout computed without any run (`minitron groups`). ``words`` holds the
small rules of writing that all of them share: rank ranges, plurals, names that fit.
"""
