// cert-manager runs the real cert-manager controller and cainjector out of cluster, against the dev
// cluster's API server, for NodeGate's tests and `nodegate dev up --cert-manager`.
//
// cert-manager publishes its commands (cmd/controller, cmd/cainjector) as modules that the Go module
// proxy cannot serve (other module paths, replace directives), but everything they run lives in the
// public pkg/ tree of github.com/cert-manager/cert-manager. This command wires those packages the way
// the upstream commands do, with a smaller surface:
//
//	cert-manager controller --kubeconfig FILE   the issuers, clusterissuers, certificates-* and
//	                                            certificaterequests (approver, selfsigned, ca) loops
//	cert-manager cainjector --kubeconfig FILE   caBundle injection into webhook configurations,
//	                                            APIServices and CRDs (cert-manager.io/inject-ca-from)
//
// With --ready-address HOST:PORT, GET /readyz answers 200 once the informers have synced (503 before).
//
// Left out on purpose: ACME, Vault and Venafi issuers, the ingress/gateway shims, leader election,
// the metrics and profiling servers, and cert-manager's own admission webhook.
//
// Every cert-manager identifier used here is a compile-time reference (controller names are the
// packages' exported constants, not strings), so when a cert-manager release moves or renames one,
// `go build` fails naming the symbol and this file's line.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	crapprover "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// The issuer implementations register themselves with pkg/issuer when imported.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"

	admissionreg "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// controllers are the loops `controller` runs: what a Certificate needs from a SelfSigned or CA
// Issuer or ClusterIssuer, from the trigger to the issued Secret.
var controllers = []string{
	issuers.ControllerName,
	clusterissuers.ControllerName,
	crapprover.ControllerName,
	crselfsigned.CRControllerName,
	crca.CRControllerName,
	trigger.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	issuing.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
}

const usage = `usage: cert-manager controller|cainjector --kubeconfig FILE [flags]

  controller   issue Certificates from SelfSigned and CA (Cluster)Issuers
  cainjector   fill caBundle from cert-manager.io/inject-ca-from annotations
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	logf.InitLogs()
	defer logf.FlushLogs()

	fs := flag.NewFlagSet("cert-manager "+os.Args[1], flag.ExitOnError)
	klog.InitFlags(fs) // -v=N, as the upstream commands accept
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server to manage (required)")
	readyAddress := fs.String("ready-address", "", "HOST:PORT of GET /readyz (200 once synced); empty: none")

	var run func(context.Context) error
	switch os.Args[1] {
	case "controller":
		workers := fs.Int("workers", 5, "workers per control loop")
		clusterNS := fs.String("cluster-resource-namespace", "kube-system",
			"namespace of the Secrets that ClusterIssuers read")
		minBackoff := fs.Duration("certificate-request-minimum-backoff", time.Hour,
			"wait after a failed CertificateRequest before the next (cert-manager's default: 1h)")
		run = func(ctx context.Context) error {
			return runController(ctx, *kubeconfig, *workers, *clusterNS, *minBackoff)
		}
	case "cainjector":
		run = func(ctx context.Context) error { return runCAInjector(ctx, *kubeconfig) }
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	_ = fs.Parse(os.Args[2:])
	if *kubeconfig == "" {
		fmt.Fprintf(os.Stderr, "cert-manager %s: --kubeconfig is required\n", os.Args[1])
		os.Exit(2)
	}
	ctx = logf.NewContext(ctx, logf.Log, os.Args[1])
	if *readyAddress != "" {
		if err := serveReadiness(ctx, *readyAddress); err != nil {
			fmt.Fprintf(os.Stderr, "cert-manager %s: --ready-address: %v\n", os.Args[1], err)
			os.Exit(1)
		}
	}
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// ready is set once the informers have synced; /readyz reports it.
var ready atomic.Bool

func serveReadiness(ctx context.Context, address string) error {
	listener, err := net.Listen("tcp", address)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready.Load() {
			_, _ = w.Write([]byte("ok"))
			return
		}
		http.Error(w, "informers not synced yet", http.StatusServiceUnavailable)
	})
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.Serve(listener) }()
	go func() { <-ctx.Done(); _ = server.Close() }()
	return nil
}

func runController(ctx context.Context, kubeconfig string, workers int, clusterNS string, minBackoff time.Duration) error {
	log := logf.FromContext(ctx)
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: clusterNS,
		},
		CertificateOptions: controller.CertificateOptions{
			// cert-manager's defaults: copy every annotation but kubectl's, Flux's and Argo CD's.
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: minBackoff,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	base, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}

	known := controller.Known()
	loops := make([]controller.Interface, 0, len(controllers))
	for _, name := range controllers {
		construct, ok := known[name]
		if !ok {
			registered := make([]string, 0, len(known))
			for n := range known {
				registered = append(registered, n)
			}
			sort.Strings(registered)
			return fmt.Errorf("controller %q is not registered by this cert-manager (registered: %s); "+
				"its package no longer calls controller.Register under that name", name, strings.Join(registered, ", "))
		}
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("starting controller %q: %w", name, err)
		}
		loops = append(loops, loop)
	}

	var wg sync.WaitGroup
	errs := make(chan error, len(loops))
	for i, loop := range loops {
		wg.Add(1)
		go func(name string, loop controller.Interface) {
			defer wg.Done()
			if err := loop.Run(workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %q: %w", name, err)
			}
		}(controllers[i], loop)
	}
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	go func() {
		synced := true
		for informer, ok := range base.SharedInformerFactory.WaitForCacheSync(ctx.Done()) {
			synced = synced && ok
			if !ok {
				log.Info("informer did not sync", "type", informer.String())
			}
		}
		for informer, ok := range base.KubeSharedInformerFactory.WaitForCacheSync(ctx.Done()) {
			synced = synced && ok
			if !ok {
				log.Info("informer did not sync", "type", informer)
			}
		}
		ready.Store(synced)
	}()
	log.Info("cert-manager controller running", "version", util.AppVersion, "controllers", strings.Join(controllers, ","))

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case err := <-errs:
		return err
	case <-done:
	}
	base.HTTP01ResourceMetadataInformersFactory.Shutdown()
	base.KubeSharedInformerFactory.Shutdown()
	base.SharedInformerFactory.Shutdown()
	return nil
}

func runCAInjector(ctx context.Context, kubeconfig string) error {
	log := logf.FromContext(ctx)
	ctrl.SetLogger(logf.Log)
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")

	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:  scheme,
		Cache:   cache.Options{ReaderFailOnMissingInformer: true},
		Metrics: metricsserver.Options{BindAddress: "0"}, // no metrics server
		// Secrets are read from the API server on each reconcile, as upstream does, instead of a
		// cache of every Secret in the cluster.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	// The Certificate data source watches Certificates: wait for their CRD, saying so, rather than
	// fail at start when the cainjector comes up before the CRDs are installed.
	direct, err := client.New(restConfig, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	for waited := time.Duration(0); ; waited += time.Second {
		err := direct.Get(ctx, types.NamespacedName{Name: "certificates.cert-manager.io"}, &apiext.CustomResourceDefinition{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("looking up the certificates.cert-manager.io CRD: %w", err)
		}
		if waited%(30*time.Second) == 0 {
			log.Info("waiting for the certificates.cert-manager.io CRD (cert-manager's CRDs are not installed)")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}

	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.APIServiceName:                     true,
			cainjector.CustomResourceDefinitionName:       true,
		},
	})
	if err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	// Ready once the informers of what the injectors read and write have synced (GetInformer returns
	// the shared informer the injectors use, and blocks until it has).
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		for _, obj := range []client.Object{&cmapi.Certificate{}, &admissionreg.ValidatingWebhookConfiguration{},
			&admissionreg.MutatingWebhookConfiguration{}} {
			if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
				return fmt.Errorf("informer of %T: %w", obj, err)
			}
		}
		ready.Store(true)
		return nil
	})); err != nil {
		return err
	}
	log.Info("cert-manager cainjector running", "version", util.AppVersion)
	return mgr.Start(ctx)
}
