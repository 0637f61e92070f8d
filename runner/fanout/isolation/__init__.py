"""What keeps a worker apart on this machine: the sandbox tools, what a sandbox hides,
where a worker's processes are contained, and removing what a unit left."""
