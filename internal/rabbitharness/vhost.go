package rabbitharness

import (
	"testing"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
)

// AddVhost creates virtual host vhost on the node, open to User, and
// deletes it when t ends; it fails t if RabbitMQ refuses.
func (n *Node) AddVhost(t testing.TB, vhost string) {
	t.Helper()
	rh, err := rabbithole.NewClient(n.ManagementURL(), User, Password)
	if err != nil {
		t.Fatalf("rabbitharness: management client for %s: %v", n.Site, err)
	}
	res, err := rh.PutVhost(vhost, rabbithole.VhostSettings{})
	if err != nil {
		t.Fatalf("rabbitharness: creating virtual host %q on %s: %v", vhost, n.Site, err)
	}
	res.Body.Close()
	t.Cleanup(func() {
		if res, err := rh.DeleteVhost(vhost); err == nil {
			res.Body.Close()
		}
	})
	res, err = rh.UpdatePermissionsIn(vhost, User, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"})
	if err != nil {
		t.Fatalf("rabbitharness: opening virtual host %q on %s to %s: %v", vhost, n.Site, User, err)
	}
	res.Body.Close()
}
