"""Where the registry is looked after: its persistence checked at start, scheduled backups,
a lost registry noticed (care.py), and `loragate registry export/import` (commands.py)."""
