"""Gateway API manifests for sluice in the bench scripts (bench/soak.py,
bench/stalled.py): a Gateway with one HTTP listener, a Service with one
loopback endpoint, an HTTPRoute by hostname."""

import os


def gateway(name, port):
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: sluice.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: default}}
spec:
  gatewayClassName: sluice
  listeners:
  - {{name: http, protocol: HTTP, port: {port}}}
"""


def service(name, port):
    return f"""---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
- addresses: ["127.0.0.1"]
"""


def route(gateway, name, host, backends):
    refs = "\n".join(f"    - {{name: {b}, port: 80, weight: {w}}}" for b, w in backends)
    return f"""---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{{name: {gateway}}}]
  hostnames: [{host}]
  rules:
  - backendRefs:
{refs}
"""


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
