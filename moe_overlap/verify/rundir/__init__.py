"""Reading and writing the files of a run folder, for every surface that touches one (torch-free).

A run folder sits on a shared filesystem, written by other processes (torchrun or Slurm ranks, a person), and is
judged later, maybe from another node: nothing in it is trusted. strict_json.py (JSON with no NaN/Infinity, a
bounded depth and integer size, UTF-8 only), read.py (``read_json`` / ``read_model`` / ``read_records`` /
``read_text``: regular files only, no symbolic link followed out of the folder, size bounded before reading,
every record validated into its model; errors are RunFolderError naming the file and the field), write.py
(``write_bytes`` / ``write_text`` / ``write_with``: a temporary file in the same folder, then os.replace, so a
link at the name is replaced, never followed). Used by verify --judge, estimate --from-run, the MCP job
resources and the launchers.

May import: moe_overlap.skill.files
"""
