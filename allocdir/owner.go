package allocdir

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"sync"
)

// Owner is a numeric uid/gid pair.
type Owner struct {
	UID, GID int
}

var (
	nobodyOnce  sync.Once
	nobodyOwner *Owner
)

// Nobody returns the owner of the layout's shared directories: "nobody"
// when the agent runs as root (so that tasks running as nobody can write),
// nil (leave ownership alone) otherwise or when the system has no such
// user. It is looked up once per process.
func Nobody() *Owner {
	if os.Geteuid() != 0 {
		return nil
	}
	nobodyOnce.Do(func() {
		o, err := LookupOwner("nobody")
		if err == nil {
			nobodyOwner = o
		}
	})
	return nobodyOwner
}

// LookupOwner resolves a user name (or numeric uid) to its uid and
// primary gid.
func LookupOwner(name string) (*Owner, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, numErr := strconv.Atoi(name); numErr == nil {
			u, err = user.LookupId(name)
		}
		if err != nil {
			return nil, err
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("user %q has non-numeric uid %q", name, u.Uid)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("user %q has non-numeric gid %q", name, u.Gid)
	}
	return &Owner{UID: uid, GID: gid}, nil
}

// LookupUser is LookupOwner with the message every entry point gives for
// a user it cannot resolve ("failed to look up user ..."), so that a
// create and an exec that name the same unknown user say the same thing.
// The error wraps os/user's (user.UnknownUserError for an unknown name,
// user.UnknownUserIdError for an unknown uid).
func LookupUser(name string) (*Owner, error) {
	o, err := LookupOwner(name)
	if err != nil {
		return nil, fmt.Errorf("failed to look up user %q: %w", name, err)
	}
	return o, nil
}
