"""tf.data service: the pipeline's worker half on other machines (`tpu-pipeline serve`)."""
from tpu_pipeline.service.servers import RunningServer, dispatcher_address, serve_until_stopped, start_dispatcher, start_worker

__all__ = ["RunningServer", "dispatcher_address", "serve_until_stopped", "start_dispatcher", "start_worker"]
