"""tftpu.quant"""
