package renew

// entries is a min-heap of handles by their next event.
type entries []*Handle

func (e entries) Len() int { return len(e) }

func (e entries) Less(i, j int) bool { return e[i].at.Before(e[j].at) }

func (e entries) Swap(i, j int) {
	e[i], e[j] = e[j], e[i]
	e[i].index, e[j].index = i, j
}

func (e *entries) Push(x any) {
	h := x.(*Handle)
	h.index = len(*e)
	*e = append(*e, h)
}

func (e *entries) Pop() any {
	old := *e
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.index = -1
	*e = old[:len(old)-1]
	return h
}
