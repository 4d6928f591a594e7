package memory

import (
	"slices"

	"github.com/syncmesh/syncmesh/persistence"
)

func cloneChange(c persistence.RowChange) persistence.RowChange {
	r := cloneRow(persistence.Row{Key: c.Key, Cells: c.Cells})
	c.Key, c.Cells = r.Key, r.Cells
	c.Cleared = slices.Clone(c.Cleared)
	return c
}

// AppendChange implements persistence.ChangeWriter.
func (t *txn) AppendChange(c persistence.RowChange) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := validRowKey(c.Key); err != nil {
		return 0, err
	}
	t.st.lastChange++
	c = cloneChange(c)
	c.Seq = t.st.lastChange
	if t.st.oldestChange == 0 {
		t.st.oldestChange = c.Seq
	}
	t.st.changes.put(c.Seq, &c)
	return c.Seq, nil
}

// TrimChanges implements persistence.ChangeWriter.
func (t *txn) TrimChanges(keep uint64, trimmed func(persistence.TableKey, uint64)) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	n := 0
	for t.st.oldestChange != 0 && t.st.lastChange-t.st.oldestChange+1 > keep {
		if c, ok := t.st.changes.get(t.st.oldestChange); ok {
			if trimmed != nil {
				trimmed(persistence.TableKey{Schema: c.Schema, Table: c.Table}, c.Seq)
			}
			t.st.changes.del(t.st.oldestChange)
			n++
		}
		if t.st.oldestChange == t.st.lastChange {
			t.st.oldestChange = 0
			break
		}
		t.st.oldestChange++
	}
	// Past a raised gap, the oldest retained is the next stored change.
	for t.st.oldestChange != 0 {
		if _, ok := t.st.changes.get(t.st.oldestChange); ok {
			break
		}
		if t.st.oldestChange >= t.st.lastChange {
			t.st.oldestChange = 0
			break
		}
		t.st.oldestChange++
	}
	return n, nil
}

// RaiseChangeSeq implements persistence.ChangeWriter. The sequences
// skipped hold no change; trimming passes over them.
func (t *txn) RaiseChangeSeq(floor uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	if floor > t.st.lastChange {
		t.st.lastChange = floor
	}
	return nil
}

// ChangeBounds implements persistence.ChangeReader.
func (t *txn) ChangeBounds() (oldest, last uint64, err error) {
	if err := t.check(false); err != nil {
		return 0, 0, err
	}
	return t.st.oldestChange, t.st.lastChange, nil
}

// ChangeTablesAfter implements persistence.ChangeReader.
func (t *txn) ChangeTablesAfter(after uint64, fn func(persistence.TableKey, uint64) bool) error {
	if err := t.check(false); err != nil {
		return err
	}
	if t.st.oldestChange == 0 {
		return nil
	}
	for seq := max(after+1, t.st.oldestChange); seq <= t.st.lastChange && seq != 0; seq++ {
		c, ok := t.st.changes.get(seq)
		if !ok {
			continue
		}
		if !fn(persistence.TableKey{Schema: c.Schema, Table: c.Table}, seq) {
			return nil
		}
	}
	return nil
}

// ChangesAfter implements persistence.ChangeReader.
func (t *txn) ChangesAfter(tk persistence.TableKey, after uint64, limit int, fn func(persistence.RowChange) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	if t.st.oldestChange == 0 {
		return nil
	}
	visited := 0
	for seq := max(after+1, t.st.oldestChange); seq <= t.st.lastChange && seq != 0; seq++ {
		c, ok := t.st.changes.get(seq)
		if !ok || c.Schema != tk.Schema || c.Table != tk.Table {
			continue
		}
		more, err := fn(cloneChange(*c))
		if err != nil || !more {
			return err
		}
		if visited++; limit > 0 && visited >= limit {
			return nil
		}
	}
	return nil
}
