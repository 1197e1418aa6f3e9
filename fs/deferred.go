package fs

// Notifications a request handler's own change causes wait until the
// handler returns: a notification sent inside a handler can deadlock.

// handlerChange runs change, a change of the store made by a FUSE request
// handler about allocations ids, with the kernel notifications the
// store's OnChange hook sends for them deferred until after the handler
// returns.
func (m *Mount) handlerChange(ids []string, change func() error) error {
	m.deferred.mu.Lock()
	for _, id := range ids {
		m.deferred.ids[id]++
	}
	m.deferred.mu.Unlock()
	defer func() {
		m.deferred.mu.Lock()
		for _, id := range ids {
			if m.deferred.ids[id]--; m.deferred.ids[id] <= 0 {
				delete(m.deferred.ids, id)
			}
		}
		m.deferred.mu.Unlock()
	}()
	return change()
}

// fromHandler reports whether a change of allocation id comes from a
// request handler (handlerChange), whose notifications must wait.
func (m *Mount) fromHandler(id string) bool {
	m.deferred.mu.Lock()
	defer m.deferred.mu.Unlock()
	return m.deferred.ids[id] > 0
}

// later runs fn on a goroutine of its own: a notification of the kernel
// that must not be sent from the request handler that caused it.
func (m *Mount) later(fn func()) {
	m.deferred.wg.Add(1)
	go func() {
		defer m.deferred.wg.Done()
		fn()
	}()
}
