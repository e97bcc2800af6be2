"""Private helpers shared by the drivers and the host (not part of the plugin SDK): typed
records to JSON (:mod:`.records`), strict JSON (:mod:`.strictjson`), text from files made safe
to print (:mod:`.safetext`), lazy package exports (:mod:`.lazy`), output-path checks
(:mod:`.outputs`), the device setting (:mod:`.devices`) and the paper's data constants
(:mod:`.constants`).  None of them imports torch at module level."""
