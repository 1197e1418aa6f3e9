package nomadagent

import (
	"testing"

	"github.com/allocfs/allocfs/integration/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
