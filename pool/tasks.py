from celery import shared_task

from pool import services, workloads


@shared_task(name="pool.mark_unreachable_nodes")
def mark_unreachable_nodes() -> int:
    return len(services.mark_unreachable_nodes())


@shared_task(name="pool.verify_burned_in_providers")
def verify_burned_in_providers() -> list[str]:
    return services.verify_burned_in_providers()


@shared_task(name="pool.delete_old_workload_logs")
def delete_old_workload_logs() -> int:
    return workloads.delete_old_logs()
