from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0002_node_location_conflicts'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='gpu_topology',
            field=models.JSONField(blank=True, default=dict, help_text='How its GPUs are wired, as its agent reports it (agents.node.protocol\'s gpu_topology): {"links": GPU × GPU matrix of NV#/PIX/PXB/PHB/NODE/SYS, "numa": each GPU\'s NUMA node}; {}: not reported.'),
        ),
        migrations.AlterField(
            model_name='node',
            name='measured_watts',
            field=models.FloatField(blank=True, help_text="Draw beyond node_watts last read: GPU + CPU packages, or its BMC's whole-chassis figure less node_watts.", null=True),
        ),
    ]
