// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3/etcdmain),
// built from the Go module proxy for the TrainJob integration tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
