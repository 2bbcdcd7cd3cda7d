// Wrapper module: Katib v0.19.0's own reading of a trial's job status
// (pkg/controller.v1beta1/trial/util.GetDeployedJobStatus), with Katib's default success and
// failure conditions for Kubeflow training jobs (experiments/v1beta1 constants), as its trial
// controller applies them to a TFJob. Reads the job (JSON) on stdin; prints the trial job
// status Katib derives (JSON: condition Running, Succeeded or Failed, reason, message).
// Used by tests/integration/test_tfjob.py on TFJobs our operator ran. Built by install.sh.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	experimentsv1beta1 "github.com/kubeflow/katib/pkg/apis/controller/experiments/v1beta1"
	trialsv1beta1 "github.com/kubeflow/katib/pkg/apis/controller/trials/v1beta1"
	"github.com/kubeflow/katib/pkg/controller.v1beta1/trial/util"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	obj := map[string]interface{}{}
	if err := json.Unmarshal(data, &obj); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	trial := &trialsv1beta1.Trial{}
	trial.Spec.SuccessCondition = experimentsv1beta1.DefaultKubeflowJobSuccessCondition
	trial.Spec.FailureCondition = experimentsv1beta1.DefaultKubeflowJobFailureCondition
	status, err := util.GetDeployedJobStatus(trial, &unstructured.Unstructured{Object: obj})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := json.Marshal(status)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(string(out))
}
