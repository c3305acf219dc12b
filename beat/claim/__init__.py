"""Every decision of a claim, as pure functions: which fire times of a due
schedule run and which are skipped (``policies``), what the claim writes
(``planning``), how far ahead it claims (``window``) and the run IDs it draws
(``run_ids``). The store carries these decisions out; nothing here reads a
server or a clock of its own."""
