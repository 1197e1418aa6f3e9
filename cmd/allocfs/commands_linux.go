package main

// nodeCommands are those that run a node, which only Linux can.
var nodeCommands = []command{
	{"serve", "mount the allocation directories and serve the control API", runServe},
	{"exec", "run a command as a task of an allocation, its output rotated into alloc/logs", runExec},
	{"fuse-holder", "hold the FUSE connection while serve restarts (started by serve)", runHolder},
}
