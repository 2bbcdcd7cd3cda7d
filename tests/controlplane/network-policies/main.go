// kube-network-policies (SIG Network's NetworkPolicy enforcement, one process per node) for the
// test node, run as a host process beside kube-proxy (tests/controlplane/node.py).
//
// Why not the module's own cmd/main.go: v0.8.0 takes its API credentials only from the
// in-cluster files under /var/run/secrets/kubernetes.io (a host process has none, and writing
// them on the host would make every other client on the machine believe it runs in a pod); it
// stops on SIGINT only, then sleeps 5 s. This is the same wiring with a kubeconfig, SIGTERM and
// no AdminNetworkPolicy (no CRDs here), plus --cleanup (like kube-proxy's) to remove the
// controller's nftables table after a crash. NRI stays on although containerd 1.6 has none (its
// plugin finds no socket, logs so once, and pod IPs come from the API server): with
// NRIdisabled, v0.8.0 dereferences the missing plugin for the first packet from or to an address
// that is no pod's, and panics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// The controller's default table name (networkpolicy.Config.Defaults).
const tableName = "kube-network-policies"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the node's credentials (required)")
	hostname := flag.String("hostname-override", "", "the Node's name (default: the hostname)")
	queueID := flag.Int("nfqueue-id", 100, "the NFQUEUE number whose packets get a verdict")
	metrics := flag.String("metrics-bind-address", "127.0.0.1:9080", "address of /metrics")
	failOpen := flag.Bool("fail-open", false, "accept packets when the controller is not running")
	bug1766 := flag.Bool("netfilter-bug-1766-fix", false,
		"send DNS through the queue at PREROUTING (a conntrack race fixed in kernel 6.12)")
	cleanup := flag.Bool("cleanup", false, "remove the controller's nftables table and exit")
	klog.InitFlags(nil)
	flag.Parse()

	if *cleanup {
		if err := deleteTable(); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig is required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *hostname, *queueID, *metrics, *failOpen, *bug1766); err != nil {
		klog.ErrorS(err, "kube-network-policies failed")
		os.Exit(1)
	}
}

func run(kubeconfig, hostname string, queueID int, metrics string, failOpen, bug1766 bool) error {
	ctx, cancel := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer cancel()

	if _, _, err := net.SplitHostPort(metrics); err != nil {
		return fmt.Errorf("--metrics-bind-address %q: %w", metrics, err)
	}
	if hostname == "" {
		var err error
		if hostname, err = os.Hostname(); err != nil {
			return err
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(
		client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil, // nodes, AdminNetworkPolicy client and informers: not enabled
		networkpolicy.Config{
			FailOpen:            failOpen,
			QueueID:             queueID,
			NodeName:            hostname,
			NetfilterBug1766Fix: bug1766,
		},
	)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	server := &http.Server{Addr: metrics, Handler: mux}
	go func() {
		if err := server.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "metrics server")
		}
	}()
	defer server.Close()

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// Run returns once ctx is cancelled, after removing its nftables table and closing the
	// queue: waiting for it (instead of upstream's fixed 5 s sleep) is the clean stop.
	return controller.Run(ctx)
}

// deleteTable removes the controller's table, whether it exists or not (add then delete, in
// one transaction, never fails on a missing table).
func deleteTable() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	table := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	conn.AddTable(table)
	conn.DelTable(table)
	return conn.Flush()
}
