"""What every part of the client shares: the wire format (:mod:`.events`), the settings (:mod:`.config`) and the
error tree (:mod:`.errors`). Imports nothing else of the client."""
