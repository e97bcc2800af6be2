"""``lip import``: certify a model trained elsewhere (a checkpoint saved by another project's
code, read without running code, mapped onto lipcli components by an ``importer`` component:
:mod:`lipcli.sdk.importers`).  :func:`import_checkpoint` writes the model file and returns an
:class:`ImportReport`."""

from lipcli.importing.driver import ImportReport, check_against_plan, compare_imported, import_checkpoint, prepare

__all__ = ["ImportReport", "check_against_plan", "compare_imported", "import_checkpoint", "prepare"]
